# Installs the build into a fresh prefix, then builds and runs a downstream
# project that finds recflow with find_package(recflow), with liburing and
# libzip under a prefix of their own (PKG_CONFIG_PATH), as a user who built
# them there has them: the downstream link takes them from there.
file(REMOVE_RECURSE ${WORK_DIR})
set(DEPS_PREFIX ${WORK_DIR}/deps)
include(${CMAKE_CURRENT_LIST_DIR}/deps_prefix.cmake)
run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${WORK_DIR}/prefix)
run(${WORK_DIR}/prefix/bin/recflow --version)
run(${CMAKE_COMMAND} -E env ${DEPS_ENV}
    ${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR}/build -G ${GENERATOR}
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix)
expect_prefix_links(${WORK_DIR}/build "the downstream project")
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
run(${WORK_DIR}/build/downstream ${WORK_DIR}/roundtrip.tfrecord.gz)
