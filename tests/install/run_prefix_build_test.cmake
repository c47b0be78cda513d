# recflow itself configured against liburing and libzip under a prefix
# (PKG_CONFIG_PATH, as a user who built them there): every link command
# takes them from the prefix, by full path, never by -luring/-lzip.  With
# -DFULL_BUILD=ON (the `slow` test) it also builds the recflow tool that
# way and runs it.
file(REMOVE_RECURSE ${WORK_DIR})
set(DEPS_PREFIX ${WORK_DIR}/deps)
include(${CMAKE_CURRENT_LIST_DIR}/deps_prefix.cmake)
run(${CMAKE_COMMAND} -E env ${DEPS_ENV}
    ${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR}/build -G ${GENERATOR}
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH=${DEPS_PREFIX}
    -DRECFLOW_BUILD_TESTS=OFF -DRECFLOW_BUILD_BENCH=OFF -DRECFLOW_PYTHON=OFF
    -DRECFLOW_CUDA=OFF -DRECFLOW_MPI=OFF)
expect_prefix_links(${WORK_DIR}/build "recflow")
if(FULL_BUILD)
  run(${CMAKE_COMMAND} --build ${WORK_DIR}/build --target recflow)
  run(${WORK_DIR}/build/tools/recflow --version)
endif()
