# Deployment tests (deploy/, docker-compose.yml): pytest, labelled `deploy`.
# Included from tests/CMakeLists.txt. They run on the venv that
# scripts/install-test-tools.sh creates (build/venv: Debian's python3 with
# pytest and PyYAML, plus kubernetes-validate); a bare `python3` could be
# another interpreter (pyenv's here) without them, since ctest resolves the
# command when CMake configures, not through the test's PATH.
add_test(NAME deploy COMMAND ${CMAKE_SOURCE_DIR}/build/venv/bin/python3 -m pytest -q
                             ${CMAKE_SOURCE_DIR}/tests/deploy)
set_tests_properties(deploy PROPERTIES LABELS deploy TIMEOUT 300
                     ENVIRONMENT_MODIFICATION
                     "PATH=path_list_prepend:${CMAKE_SOURCE_DIR}/build/venv/bin;PYTHONDONTWRITEBYTECODE=set:1")
