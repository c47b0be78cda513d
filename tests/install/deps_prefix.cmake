# Included by the install tests: copies liburing and libzip (headers, the
# shared library, a pkg-config file) from where pkg-config finds them into
# ${DEPS_PREFIX}, as a user who built them under a prefix has them.  Sets
# DEPS_ENV: the environment that points pkg-config there.  Defines run()
# (a command that must succeed) and expect_prefix_links().
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}")
  endif()
endfunction()

find_program(PKG_CONFIG pkg-config REQUIRED)
function(pc_var out module var)
  execute_process(COMMAND ${PKG_CONFIG} --variable=${var} ${module}
                  OUTPUT_VARIABLE v OUTPUT_STRIP_TRAILING_WHITESPACE
                  RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "pkg-config knows no ${module}")
  endif()
  set(${out} "${v}" PARENT_SCOPE)
endfunction()

file(REMOVE_RECURSE ${DEPS_PREFIX})
file(MAKE_DIRECTORY ${DEPS_PREFIX}/include ${DEPS_PREFIX}/lib/pkgconfig)
foreach(module liburing libzip)
  pc_var(libdir ${module} libdir)
  pc_var(includedir ${module} includedir)
  execute_process(COMMAND ${PKG_CONFIG} --modversion ${module}
                  OUTPUT_VARIABLE version OUTPUT_STRIP_TRAILING_WHITESPACE)
  string(REGEX REPLACE "^lib" "" name ${module})
  # The library, its symbolic links resolved, under its link name.
  file(REAL_PATH ${libdir}/lib${name}.so library)
  file(COPY_FILE ${library} ${DEPS_PREFIX}/lib/lib${name}.so)
  if(module STREQUAL "liburing")
    file(COPY ${includedir}/liburing.h ${includedir}/liburing
         DESTINATION ${DEPS_PREFIX}/include)
  else()
    # zipconf.h sits in the multiarch folder on Debian.
    file(GLOB zipconf ${includedir}/zipconf.h ${includedir}/*/zipconf.h)
    file(COPY ${includedir}/zip.h ${zipconf} DESTINATION ${DEPS_PREFIX}/include)
  endif()
  file(WRITE ${DEPS_PREFIX}/lib/pkgconfig/${module}.pc
"prefix=${DEPS_PREFIX}
libdir=\${prefix}/lib
includedir=\${prefix}/include

Name: ${module}
Description: ${module}, copied under a prefix by recflow's install tests
Version: ${version}
Libs: -L\${libdir} -l${name}
Cflags: -I\${includedir}
")
endforeach()
set(DEPS_ENV PKG_CONFIG_PATH=${DEPS_PREFIX}/lib/pkgconfig)

# Fails unless the link commands in `build_dir` take liburing and libzip
# from the prefix (full paths), never by name (-luring, -lzip: whatever the
# linker's default folders hold).
function(expect_prefix_links build_dir what)
  if(EXISTS ${build_dir}/build.ninja)
    file(READ ${build_dir}/build.ninja commands)
  else()
    file(GLOB_RECURSE link_files ${build_dir}/*/link.txt)
    set(commands "")
    foreach(f ${link_files})
      file(READ ${f} c)
      string(APPEND commands "${c}")
    endforeach()
  endif()
  foreach(name uring zip)
    string(FIND "${commands}" "${DEPS_PREFIX}/lib/lib${name}.so" at)
    if(at EQUAL -1)
      message(FATAL_ERROR
              "${what}: lib${name} is not linked from ${DEPS_PREFIX}/lib")
    endif()
    if(commands MATCHES "[ \t]-l${name}[ \t\n]")
      message(FATAL_ERROR "${what}: lib${name} is linked by name (-l${name})")
    endif()
    pc_var(system_libdir lib${name} libdir)
    string(FIND "${commands}" "${system_libdir}/lib${name}.so" at)
    if(NOT at EQUAL -1)
      message(FATAL_ERROR
              "${what}: lib${name} is linked from ${system_libdir}, not the "
              "prefix")
    endif()
  endforeach()
endfunction()
