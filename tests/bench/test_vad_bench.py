"""`hark bench vad`: the four costs, at each batch size."""

from __future__ import annotations

from hark.bench.vad import measure, summary


async def test_measures_every_batch_size() -> None:
    report = await measure([1, 4], seconds=0.2, max_wait_ms=2.0)
    assert [row["batch"] for row in report["rows"]] == [1, 4]
    for row in report["rows"]:
        for key in ("model_ms", "matmul_ms", "unbatched_ms", "batched_ms"):
            assert row[key] > 0
        assert row["batched_sessions_per_core"] > 0
    table = summary(report)
    assert "batched" in table and "matmul" in table and len(table.splitlines()) == 4
