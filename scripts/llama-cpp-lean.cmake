# Included by llama.cpp's project() while llama-cpp-python compiles it (scripts/lib.sh names
# this file in CMAKE_ARGS). llama-cpp-python forces llama.cpp's common library on, but its
# Python package loads only libllama and libggml: the common library and the HTTP client it
# links are two fifths of the compile and are never loaded. A plain variable set here, in
# llama.cpp's own directory, hides the forced cache entry from llama.cpp's CMakeLists.
set(LLAMA_BUILD_COMMON OFF)
