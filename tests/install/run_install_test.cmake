# Installs the build into a fresh prefix, then builds and runs a downstream
# project that finds recflow with find_package(recflow), with liburing and
# libzip under a prefix of their own (PKG_CONFIG_PATH), as a user who built
# them there has them: the downstream link takes them from there.
file(REMOVE_RECURSE ${WORK_DIR})
set(DEPS_PREFIX ${WORK_DIR}/deps)
include(${CMAKE_CURRENT_LIST_DIR}/deps_prefix.cmake)
run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${WORK_DIR}/prefix)
run(${WORK_DIR}/prefix/bin/recflow --version)
# Only the API is installed: the layers' internal headers stay out.
foreach(internal pipeline/stages.h pipeline/async_iterator.h
                 pipeline/global_shuffle.h records/io_faults.h
                 train/thread_team.h train/cuda_allocator.h)
  if(EXISTS ${WORK_DIR}/prefix/include/recflow/${internal})
    message(FATAL_ERROR "internal header ${internal} was installed")
  endif()
endforeach()
foreach(api pipeline/dataset.h pipeline/process.h records/dtype.h
            train/estimator.h convert/convert.h)
  if(NOT EXISTS ${WORK_DIR}/prefix/include/recflow/${api})
    message(FATAL_ERROR "API header ${api} was not installed")
  endif()
endforeach()
run(${CMAKE_COMMAND} -E env ${DEPS_ENV}
    ${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR}/build -G ${GENERATOR}
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix)
expect_prefix_links(${WORK_DIR}/build "the downstream project")
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
run(${WORK_DIR}/build/downstream ${WORK_DIR}/roundtrip.tfrecord.gz)
