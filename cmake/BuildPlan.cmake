# What this build compiles, said first: CUDA or not, which GPU paths for which GPUs, which head
# dims, roughly how long, and how to build less. Also resolves FLASHATTN_CUDA_ARCHS:
#   auto    (default) the GPUs of this machine, as `native`, when nvidia-smi (or nvcc's own device
#           query) finds any; otherwise every path, 80;90a, so that a GPU-less build box still
#           makes a library that runs on any supported GPU
#   native  the GPUs of this machine; an error when none is found (CMake's own `native` fails the
#           same way, which is why the GPUs are looked for first)
#   80;90a  an explicit list: 80 = the portable sm80 path (runs on sm80+), 90a = the Hopper path
# For the GPUs found: cc 8.x -> the sm80 path as sm_80 SASS; cc 9.0 -> the Hopper path (sm90a)
# plus the sm80 path as sm_90 SASS only (it serves the head dims and options sm90 lacks). The
# resolved list replaces FLASHATTN_CUDA_ARCHS as a normal variable, so every `IN_LIST` test below
# sees it; FLASHATTN_SM80_SASS is narrowed the same way unless it was set by hand.
# Under pip (SKBUILD) the summary also goes to the terminal (/dev/tty) when there is one: pip shows
# a build backend's output only with -v, and a silent multi-minute spinner is the worst default.

set(_fa_gpus "")       # "8.0 NVIDIA A100-SXM4-80GB" ... (or just "9.0" from nvcc's query)
set(_fa_ccs "")        # 80 90 ...
function(_fa_find_gpus)
  set(ccs "")
  set(gpus "")
  find_program(FLASHATTN_NVIDIA_SMI nvidia-smi)
  mark_as_advanced(FLASHATTN_NVIDIA_SMI)
  if(FLASHATTN_NVIDIA_SMI)
    execute_process(COMMAND "${FLASHATTN_NVIDIA_SMI}" --query-gpu=compute_cap,name --format=csv,noheader
                    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_QUIET TIMEOUT 60)
    if(rc EQUAL 0)
      string(REPLACE "\n" ";" lines "${out}")
      foreach(l IN LISTS lines)
        if(l MATCHES "^ *([0-9]+)\\.([0-9]+) *, *(.*[^ ]) *$")
          list(APPEND ccs "${CMAKE_MATCH_1}${CMAKE_MATCH_2}")
          list(APPEND gpus "${CMAKE_MATCH_3} (cc ${CMAKE_MATCH_1}.${CMAKE_MATCH_2})")
        endif()
      endforeach()
    endif()
  endif()
  # No nvidia-smi (some containers): the tool CMake's `native` uses, next to nvcc.
  if(NOT ccs AND CMAKE_CUDA_COMPILER)
    get_filename_component(bindir "${CMAKE_CUDA_COMPILER}" DIRECTORY)
    if(EXISTS "${bindir}/__nvcc_device_query")
      execute_process(COMMAND "${bindir}/__nvcc_device_query" RESULT_VARIABLE rc OUTPUT_VARIABLE out
                      ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE TIMEOUT 60)
      if(rc EQUAL 0 AND out MATCHES "^[0-9;,]+$")
        string(REPLACE "," ";" ccs "${out}")
        foreach(cc IN LISTS ccs)
          math(EXPR major "${cc} / 10")
          math(EXPR minor "${cc} % 10")
          list(APPEND gpus "GPU (cc ${major}.${minor})")
        endforeach()
      endif()
    endif()
  endif()
  set(_fa_ccs "${ccs}" PARENT_SCOPE)
  set(_fa_gpus "${gpus}" PARENT_SCOPE)
endfunction()

set(_fa_sm80_sass_default "80-real;90-real")  # src/sm80/CMakeLists.txt's cache default
set(_fa_for "")                               # for whom, in words
if(FLASHATTN_CUDA)
  enable_language(CUDA)  # (again, for the top-level file: a no-op) nvcc's version for the summary
  if(FLASHATTN_CUDA_ARCHS STREQUAL "auto" OR FLASHATTN_CUDA_ARCHS STREQUAL "native")
    _fa_find_gpus()
    if(NOT _fa_ccs)
      if(FLASHATTN_CUDA_ARCHS STREQUAL "native")
        message(FATAL_ERROR "flashattn: FLASHATTN_CUDA_ARCHS=native but no GPU was found (nvidia-smi, "
                            "__nvcc_device_query); use auto (every path when no GPU), or 80;90a, 80 or 90a")
      endif()
      set(FLASHATTN_CUDA_ARCHS "80;90a")
      set(_fa_for "every supported GPU, as none was found here (a GPU machine builds only its own)")
    else()
      set(_fa_archs "")
      set(_fa_sass "")
      set(_fa_other "")
      foreach(cc IN LISTS _fa_ccs)
        if(cc MATCHES "^8[0-9]$")
          list(APPEND _fa_archs 80)
          list(APPEND _fa_sass 80-real)
        elseif(cc STREQUAL "90")
          list(APPEND _fa_archs 80 90a)
          list(APPEND _fa_sass 90-real)
        else()
          list(APPEND _fa_other ${cc})
        endif()
      endforeach()
      if(_fa_other)
        message(WARNING "flashattn: no GPU path of this version is built for compute capability "
                        "${_fa_other} (paths: sm80 for 8.x, sm90a for 9.0)")
      endif()
      if(NOT _fa_archs)
        set(_fa_archs 80 90a)
        set(_fa_sass ${_fa_sm80_sass_default})
      endif()
      list(REMOVE_DUPLICATES _fa_archs)
      list(REMOVE_DUPLICATES _fa_sass)
      list(SORT _fa_sass)
      set(FLASHATTN_CUDA_ARCHS "${_fa_archs}")
      if(NOT DEFINED CACHE{FLASHATTN_SM80_SASS} OR "$CACHE{FLASHATTN_SM80_SASS}" STREQUAL "${_fa_sm80_sass_default}")
        set(FLASHATTN_SM80_SASS "${_fa_sass}")
      endif()
      list(JOIN _fa_gpus ", " _fa_gpu_words)
      set(_fa_for "the GPUs found: ${_fa_gpu_words}")
    endif()
  else()
    foreach(a IN LISTS FLASHATTN_CUDA_ARCHS)
      if(NOT a MATCHES "^(80|90a)$")
        message(WARNING "flashattn: FLASHATTN_CUDA_ARCHS entry '${a}' is not a GPU path (auto, native, or a list of 80 and 90a)")
      endif()
    endforeach()
    string(REPLACE ";" " " _fa_for "FLASHATTN_CUDA_ARCHS=${FLASHATTN_CUDA_ARCHS}")
  endif()
endif()

# ---- the summary: a few short lines -----------------------------------------------------------
cmake_host_system_information(RESULT _fa_cores QUERY NUMBER_OF_LOGICAL_CORES)
if(NOT _fa_cores GREATER 0)
  set(_fa_cores 1)
endif()
if(SKBUILD)
  set(_fa_d "-C cmake.define.")
else()
  set(_fa_d "-D")
endif()
set(_fa_lines "")  # one string per line (no semicolons in them)
if(FLASHATTN_CUDA)
  # Kernel files x SASS targets, from the same lists src/sm80 and src/sm90 use.
  set(_fa_units 0)
  set(_fa_paths "")
  if(DEFINED FLASHATTN_SM80_SASS)
    set(_fa_s80 "${FLASHATTN_SM80_SASS}")
  else()
    set(_fa_s80 "${_fa_sm80_sass_default}")
  endif()
  set(_fa_hd80 "")
  set(_fa_hd90 "")
  foreach(d IN LISTS FLASHATTN_HEADDIMS)
    if(d MATCHES "^(32|64|96|128|192|256)$")
      list(APPEND _fa_hd80 ${d})
    endif()
    if(d MATCHES "^(64|96|128|192|256)$")
      list(APPEND _fa_hd90 ${d})
    endif()
  endforeach()
  if("80" IN_LIST FLASHATTN_CUDA_ARCHS)
    list(LENGTH _fa_hd80 n)
    list(LENGTH _fa_s80 s)
    math(EXPR _fa_units "${_fa_units} + (4 * ${n} + 1) * ${s}")
    string(REPLACE "-real" "" _fa_s80_words "${_fa_s80}")
    string(REPLACE ";" ", sm_" _fa_s80_words "${_fa_s80_words}")
    list(APPEND _fa_paths "sm80 path (SASS sm_${_fa_s80_words})")
  endif()
  if("90a" IN_LIST FLASHATTN_CUDA_ARCHS)
    list(LENGTH _fa_hd90 n)
    set(per 4)
    if(FLASHATTN_SM90_ABLATION)
      set(per 10)
    endif()
    math(EXPR _fa_units "${_fa_units} + ${per} * ${n} + 2")
    list(APPEND _fa_paths "Hopper sm90a path")
  endif()
  list(JOIN _fa_paths " + " _fa_paths)
  # About 30 s of one core per kernel file and SASS target (20-25 s measured at head dim 128 on a
  # 2-core x86 CI box; larger head dims take longer), plus ~2.5 min for the longest files at the
  # end, when fewer than all cores are busy: rough (47 units on a 16-core H100 host: 242-266 s
  # measured, pip's own steps included). Ninja runs nproc+2 compilations at once.
  math(EXPR _fa_min "(${_fa_units} * 30 / ${_fa_cores} + 150 + 59) / 60")
  string(REPLACE ";" " " _fa_hd_words "${FLASHATTN_HEADDIMS}")
  list(APPEND _fa_lines
    "CUDA build (nvcc ${CMAKE_CUDA_COMPILER_VERSION}) for ${_fa_for}"
    "${_fa_paths}, head dims ${_fa_hd_words}"
    "${_fa_units} kernel compilations: roughly ${_fa_min} min on ${_fa_cores} cores"
    "faster: ${_fa_d}FLASHATTN_CUDA=OFF (CPU only, under a minute), ${_fa_d}FLASHATTN_HEADDIMS=128,"
    "        ${_fa_d}FLASHATTN_CUDA_ARCHS=90a (Hopper only) or =80 (sm80 path only)")
elseif(CMAKE_CUDA_COMPILER)
  list(APPEND _fa_lines "CPU-only build (FLASHATTN_CUDA=OFF): no GPU paths, under a minute")
else()
  list(APPEND _fa_lines "CPU-only build (no nvcc found: CUDA 12.8+ enables the GPU paths), under a minute")
endif()
set(_fa_notice "")
set(_fa_tty "")
foreach(l IN LISTS _fa_lines)
  string(APPEND _fa_notice "flashattn: ${l}\n")
  string(APPEND _fa_tty "  flashattn: ${l}\n")
endforeach()
string(STRIP "${_fa_notice}" _fa_notice)
set(_fa_tty_rc 1)
if(SKBUILD)
  # pip shows a build backend's output only with -v: say this much on the terminal itself
  # (nothing without one, as in CI: then it is only in the log below). \b first: over the
  # spinner's character; the spinner then carries on at the start of the next line.
  string(APPEND _fa_tty "  flashattn: pip shows the compiler's progress only with -v (pip install -v .)\n   ")
  execute_process(COMMAND sh -c "{ printf '\\b \\n%s' \"$1\" > /dev/tty; } 2>/dev/null" sh "${_fa_tty}"
                  RESULT_VARIABLE _fa_tty_rc OUTPUT_QUIET ERROR_QUIET)
endif()
if(NOT _fa_tty_rc EQUAL 0)  # (on the terminal already: not twice with pip -v)
  message(NOTICE "${_fa_notice}")
endif()
