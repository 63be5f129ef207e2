# The offline command line (score, generate) against the golden vectors, a
# converted official checkpoint scored and served over gRPC (the generated API
# modules and tests/util on PYTHONPATH), and the benchmarks' roofline chart
# (bench/roofline_chart.py, matplotlib), the pool timeline
# (bench/pool_timeline.py), the GPU suite's summary (bench/gpu_summary.py),
# serving_overhead.py's CPU accounting, serving_scores.py's windows,
# switchserve-bench's flag checks and
# the SIMT executor under a thread limit:
# pytest on Debian's python3 (numpy, torch, grpcio), labelled `cli`.
add_test(NAME cli COMMAND /usr/bin/python3 -m pytest -q ${CMAKE_CURRENT_SOURCE_DIR}/cli)
set(cli_environment
    "SWITCHSERVE_BINARY=$<TARGET_FILE:switchserve>;PYTHONDONTWRITEBYTECODE=1;PYTHONPATH=${SWITCHSERVE_PROTO_PYTHON_DIR}:${CMAKE_SOURCE_DIR}/tests/util")
if(SWITCHSERVE_BUILD_BENCH)  # switchserve-bench's flags (test_bench_flags.py)
  list(APPEND cli_environment "SWITCHSERVE_BENCH=$<TARGET_FILE:switchserve-bench>")
endif()
if(SWITCHSERVE_SIMT)  # the SIMT executor under a thread limit (test_simt_thread_limit.py)
  list(APPEND cli_environment "SWITCHSERVE_SIMT_EXECUTOR_TEST=$<TARGET_FILE:simt_executor_test>")
endif()
set_tests_properties(cli PROPERTIES LABELS cli TIMEOUT 600 ENVIRONMENT "${cli_environment}")
