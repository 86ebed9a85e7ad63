# bpf_object(NAME SRC)
#
# Compiles bpf/<SRC> with clang for the BPF target (CO-RE, against a vmlinux.h
# generated from the running kernel's BTF) and generates a libbpf skeleton with
# bpftool. Gives an INTERFACE target NAME_skel that carries the include path of
# <NAME>.skel.h and links libbpf.
find_program(BPF_CLANG NAMES clang-14 clang REQUIRED)
find_program(BPFTOOL NAMES bpftool REQUIRED)

set(TLSPROF_VMLINUX_DIR ${CMAKE_BINARY_DIR}/vmlinux)
set(TLSPROF_VMLINUX_H ${TLSPROF_VMLINUX_DIR}/vmlinux.h)
set(TLSPROF_BTF_PATH /sys/kernel/btf/vmlinux CACHE FILEPATH "Kernel BTF used to generate vmlinux.h")
add_custom_command(
  OUTPUT ${TLSPROF_VMLINUX_H}
  COMMAND ${CMAKE_COMMAND} -E make_directory ${TLSPROF_VMLINUX_DIR}
  COMMAND ${BPFTOOL} btf dump file ${TLSPROF_BTF_PATH} format c > ${TLSPROF_VMLINUX_H}.tmp
  COMMAND ${CMAKE_COMMAND} -E rename ${TLSPROF_VMLINUX_H}.tmp ${TLSPROF_VMLINUX_H}
  COMMENT "Generating vmlinux.h from ${TLSPROF_BTF_PATH}"
  VERBATIM)
add_custom_target(vmlinux_h DEPENDS ${TLSPROF_VMLINUX_H})

function(bpf_object name src)
  set(obj ${CMAKE_CURRENT_BINARY_DIR}/${name}.bpf.o)
  set(skel ${CMAKE_CURRENT_BINARY_DIR}/${name}.skel.h)
  file(GLOB headers ${CMAKE_CURRENT_SOURCE_DIR}/*.h)
  add_custom_command(
    OUTPUT ${obj}
    COMMAND ${BPF_CLANG} -g -O2 -Wall -target bpf -D__TARGET_ARCH_x86
            -I${TLSPROF_VMLINUX_DIR} -I${CMAKE_CURRENT_SOURCE_DIR}
            -c ${CMAKE_CURRENT_SOURCE_DIR}/${src} -o ${obj}
    DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/${src} ${headers} ${TLSPROF_VMLINUX_H}
    COMMENT "BPF ${src}"
    VERBATIM)
  add_custom_command(
    OUTPUT ${skel}
    COMMAND ${BPFTOOL} gen skeleton ${obj} name ${name} > ${skel}.tmp
    COMMAND ${CMAKE_COMMAND} -E rename ${skel}.tmp ${skel}
    DEPENDS ${obj}
    COMMENT "Skeleton ${name}.skel.h"
    VERBATIM)
  add_custom_target(${name}_skel_gen DEPENDS ${skel})
  # vmlinux.h is made by a rule of the top directory: a file dependency alone is not seen across directories by
  # the Makefiles generator (only Ninja has one global graph), so the order is also stated between targets.
  add_dependencies(${name}_skel_gen vmlinux_h)
  add_library(${name}_skel INTERFACE)
  add_dependencies(${name}_skel ${name}_skel_gen)
  target_include_directories(${name}_skel INTERFACE ${CMAKE_CURRENT_BINARY_DIR} ${CMAKE_CURRENT_SOURCE_DIR})
  target_link_libraries(${name}_skel INTERFACE PkgConfig::LIBBPF)
endfunction()
