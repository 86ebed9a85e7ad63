# Debian's BoringSSL (android-libboringssl-dev): a stripped shared build,
# libssl.so.0 and libcrypto.so.0 in a private directory, headers in
# /usr/include/android. TLSPROF_HAVE_BORINGSSL says whether it is installed;
# where it is not, its workloads are left out with a note and the tests that
# need them fail (never skipped in silence).
set(TLSPROF_BORINGSSL_INCLUDE_DIR /usr/include/android CACHE PATH "BoringSSL headers (android-libboringssl-dev)")
set(TLSPROF_BORINGSSL_LIB_DIR /usr/lib/x86_64-linux-gnu/android CACHE PATH "BoringSSL libcrypto.so/libssl.so")
if(EXISTS ${TLSPROF_BORINGSSL_INCLUDE_DIR}/openssl/is_boringssl.h AND EXISTS ${TLSPROF_BORINGSSL_LIB_DIR}/libssl.so
   AND EXISTS ${TLSPROF_BORINGSSL_LIB_DIR}/libcrypto.so)
  set(TLSPROF_HAVE_BORINGSSL ON)
else()
  set(TLSPROF_HAVE_BORINGSSL OFF)
endif()

# tlsprof_use_boringssl(<target> [SSL])
#
# Builds <target> against that BoringSSL: its headers share names with
# OpenSSL's in /usr/include and must win (-isystem, before the default path;
# SYSTEM also silences -Wignored-qualifiers in its stack.h under -Werror), so
# the sources should check OPENSSL_IS_BORINGSSL; its libraries are named by
# full path (not -lcrypto, for the same reason), libssl too with SSL, and
# reached through an rpath. Link them before anything that brings OpenSSL's
# own libraries in (libdw's libdebuginfod does), so that the program's calls
# resolve to BoringSSL's.
function(tlsprof_use_boringssl target)
  cmake_parse_arguments(B "SSL" "" "" ${ARGN})
  target_include_directories(${target} SYSTEM BEFORE PRIVATE ${TLSPROF_BORINGSSL_INCLUDE_DIR})
  if(B_SSL)
    target_link_libraries(${target} PRIVATE ${TLSPROF_BORINGSSL_LIB_DIR}/libssl.so)
  endif()
  target_link_libraries(${target} PRIVATE ${TLSPROF_BORINGSSL_LIB_DIR}/libcrypto.so)
  set_target_properties(${target} PROPERTIES
    BUILD_RPATH ${TLSPROF_BORINGSSL_LIB_DIR} INSTALL_RPATH ${TLSPROF_BORINGSSL_LIB_DIR})
endfunction()
