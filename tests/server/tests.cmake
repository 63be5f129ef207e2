# Unit tests of the server pieces (request validation, wire parsing, flags,
# shared byte budgets, request ids and log lines, the OpenAI request and
# response mapping, the HTTP server's request reading and its stop over a
# loopback connection, a completion call on an engine over the fake backend,
# the OpenAI service rendering GET /metrics off the I/O thread),
# label `unit`: no server process. Included from tests/CMakeLists.txt.
foreach(test_name request_validation_test wire_format_test server_flags_test access_log_test
                  openai_protocol_test dispatch_flags_test call_gate_test mutex_checks_test
                  thread_priority_test proto_convert_test http_request_reading_test
                  completion_call_test byte_budget_test http_server_test openai_service_test)
  add_executable(${test_name} ${CMAKE_CURRENT_LIST_DIR}/${test_name}.cc)
  target_link_libraries(${test_name} PRIVATE switchserve_http GTest::gtest_main
                                             switchserve_warnings)
  # The HTTP server's I/O thread and its stop, with no gRPC in the process,
  # also run under ThreadSanitizer (in the `tsan` build, label tsan).
  set(labels unit)
  if(SWITCHSERVE_TSAN AND test_name STREQUAL "http_server_test")
    set(labels tsan)
  endif()
  gtest_discover_tests(${test_name} PROPERTIES LABELS ${labels} DISCOVERY_TIMEOUT 60)
endforeach()
# The HTTP server's request reading works on Boost.Beast's parser.
find_package(Boost 1.74 REQUIRED)
target_link_libraries(http_request_reading_test PRIVATE Boost::headers)
# The test drives Beast's parser itself (parser.put), and GCC's ASan build
# then warns that Boost's optional<size_t> in content_length() may be used
# uninitialized, inside Beast's own header: a false positive there.
target_compile_options(http_request_reading_test
                       PRIVATE $<$<CXX_COMPILER_ID:GNU>:-Wno-maybe-uninitialized>)
# Token strings of the SentencePiece test model (testing::SourcePath).
target_link_libraries(openai_protocol_test PRIVATE switchserve_test_util)
# The test models' configs (testing::TinySwitchAllConfig).
target_link_libraries(proto_convert_test PRIVATE switchserve_test_util)
# An engine on the fake backend (testing::FakeBackend).
target_link_libraries(completion_call_test PRIVATE switchserve_test_util)
