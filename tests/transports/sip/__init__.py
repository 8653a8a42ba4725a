"""Tests of the SIP stack and media."""
