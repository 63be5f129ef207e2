# Metrics tests (label `metrics`), included from tests/CMakeLists.txt:
#   - C++ unit tests of the metric components, read back through the registry;
#   - promtool checks and unit tests of the alert rules;
#   - a real Prometheus server scraping the test exporter, evaluating every
#     dashboard and alert expression (test_prometheus.py).
set(METRICS_TEST_DIR ${CMAKE_CURRENT_LIST_DIR})

add_library(switchserve_metrics_test_support STATIC ${METRICS_TEST_DIR}/synthetic_routing.cc)
target_link_libraries(switchserve_metrics_test_support PUBLIC switchserve_moe
                                                              switchserve_warnings)

foreach(test_name moe_metrics_test serving_metrics_test metrics_exposer_test)
  add_executable(${test_name} ${METRICS_TEST_DIR}/${test_name}.cc)
  target_link_libraries(${test_name} PRIVATE switchserve_metrics switchserve_metrics_test_support
                                             GTest::gtest_main switchserve_warnings
                                             switchserve_metrics_thread_stack_floor)
  gtest_discover_tests(${test_name} PROPERTIES LABELS metrics DISCOVERY_TIMEOUT 60)
endforeach()

# The exporter the Prometheus test scrapes: real metric components on
# synthetic engine steps (metrics_exporter.cc).
add_executable(switchserve_metrics_exporter ${METRICS_TEST_DIR}/metrics_exporter.cc)
target_link_libraries(switchserve_metrics_exporter
                      PRIVATE switchserve_metrics switchserve_metrics_test_support switchserve_version absl::flags
                              absl::flags_parse absl::str_format switchserve_warnings
                              switchserve_metrics_thread_stack_floor)

# promtool comes with Debian's prometheus package (scripts/install-deps.sh).
# When it is missing the tests below fail, naming it, rather than being skipped.
find_program(PROMTOOL_PROGRAM promtool)
if(NOT PROMTOOL_PROGRAM)
  set(PROMTOOL_PROGRAM promtool)
endif()
add_test(NAME metrics_promtool_check_rules
         COMMAND ${PROMTOOL_PROGRAM} check rules ${CMAKE_SOURCE_DIR}/deploy/prometheus/alerts.yml)
add_test(NAME metrics_promtool_test_rules COMMAND ${PROMTOOL_PROGRAM} test rules alerts_test.yml
         WORKING_DIRECTORY ${METRICS_TEST_DIR})
add_test(NAME metrics_prometheus
         COMMAND /usr/bin/python3 -m pytest -q -p no:cacheprovider
                 ${METRICS_TEST_DIR}/test_prometheus.py)
set_tests_properties(
  metrics_promtool_check_rules metrics_promtool_test_rules metrics_prometheus
  PROPERTIES LABELS metrics TIMEOUT 300)
set_tests_properties(
  metrics_prometheus PROPERTIES ENVIRONMENT
  "SWITCHSERVE_METRICS_EXPORTER=$<TARGET_FILE:switchserve_metrics_exporter>")
# The same checks against `switchserve serve` under gRPC load.
add_test(NAME metrics_serve
         COMMAND /usr/bin/python3 -m pytest -q -p no:cacheprovider
                 ${METRICS_TEST_DIR}/test_serve_metrics.py)
set_tests_properties(
  metrics_serve PROPERTIES LABELS metrics TIMEOUT 300 ENVIRONMENT
  "SWITCHSERVE_BINARY=$<TARGET_FILE:switchserve>")

# Not a test: writes the paper-shaped model measure_overhead.py serves.
add_executable(switchserve_metrics_paper_model ${METRICS_TEST_DIR}/write_paper_model.cc
                                               ${CMAKE_CURRENT_LIST_DIR}/../util/random_model.cc)
target_link_libraries(switchserve_metrics_paper_model PRIVATE switchserve_moe
                                                              switchserve_warnings)
