# Metrics tests (label `metrics`), included from tests/CMakeLists.txt:
#   - C++ unit tests of the metric components, read back through the registry;
#   - promtool checks and unit tests of the alert rules;
#   - a real Prometheus server scraping the test exporter, evaluating every
#     dashboard and alert expression (test_prometheus.py).
set(METRICS_TEST_DIR ${CMAKE_CURRENT_LIST_DIR})

add_library(switchserve_metrics_test_support STATIC ${METRICS_TEST_DIR}/synthetic_routing.cc)
target_link_libraries(switchserve_metrics_test_support PUBLIC switchserve_engine
                                                              switchserve_warnings)

foreach(test_name moe_metrics_test serving_metrics_test)
  add_executable(${test_name} ${METRICS_TEST_DIR}/${test_name}.cc)
  target_link_libraries(${test_name} PRIVATE switchserve_metrics switchserve_metrics_test_support
                                             GTest::gtest_main switchserve_warnings)
  gtest_discover_tests(${test_name} PROPERTIES LABELS metrics DISCOVERY_TIMEOUT 60)
endforeach()

# The exporter the Prometheus test scrapes: real metric components on
# synthetic engine steps (metrics_exporter.cc).
add_executable(switchserve_metrics_exporter ${METRICS_TEST_DIR}/metrics_exporter.cc)
target_link_libraries(switchserve_metrics_exporter
                      PRIVATE switchserve_metrics switchserve_metrics_test_support absl::flags
                              absl::flags_parse absl::str_format switchserve_warnings)
