# Deployment tests (deploy/, docker-compose.yml): pytest, labelled `deploy`.
# Included from tests/CMakeLists.txt. scripts/install-test-tools.sh puts their
# tools in build/venv, which is put first on PATH so `python3` is the venv's.
add_test(NAME deploy COMMAND python3 -m pytest -q ${CMAKE_SOURCE_DIR}/tests/deploy)
set_tests_properties(deploy PROPERTIES LABELS deploy TIMEOUT 300
                     ENVIRONMENT_MODIFICATION "PATH=path_list_prepend:${CMAKE_SOURCE_DIR}/build/venv/bin")
