# Fills the default FLASHATTN_CUTLASS_INCLUDE (.deps/cutlass/include) with the CuTe/CUTLASS
# headers from the PyPI wheel nvidia-cutlass when they are missing, as scripts/setup does, so
# `pip install .` works from a fresh clone. Pure CMake (no pip: pip is hidden inside pip's
# isolated build environments); the pinned version is read from scripts/setup (one pin).
# Included from the top-level CMakeLists.txt when FLASHATTN_CUDA is ON. A user-given
# FLASHATTN_CUTLASS_INCLUDE is never written to. -DFLASHATTN_FETCH_CUTLASS=OFF disables this.
option(FLASHATTN_FETCH_CUTLASS "Download the CuTe headers at configure time when missing" ON)

set(_fa_cutlass_dest "${CMAKE_CURRENT_SOURCE_DIR}/.deps/cutlass")
if(FLASHATTN_FETCH_CUTLASS
   AND NOT EXISTS "${FLASHATTN_CUTLASS_INCLUDE}/cute/tensor.hpp"
   AND FLASHATTN_CUTLASS_INCLUDE STREQUAL "${_fa_cutlass_dest}/include")
  file(STRINGS "${CMAKE_CURRENT_SOURCE_DIR}/scripts/setup" _fa_pin REGEX "^CUTLASS_VERSION=")
  string(REGEX REPLACE "^CUTLASS_VERSION=\"?([0-9.]+)\"?.*" "\\1" _fa_ver "${_fa_pin}")
  if(DEFINED ENV{PIP_INDEX_URL})
    set(_fa_index "$ENV{PIP_INDEX_URL}")
  else()
    set(_fa_index "https://pypi.org/simple")
  endif()
  string(REGEX REPLACE "/+$" "" _fa_index "${_fa_index}")
  set(_fa_tmp "${CMAKE_BINARY_DIR}/_fetch_cutlass")
  file(REMOVE_RECURSE "${_fa_tmp}")
  message(STATUS "flashattn: CuTe headers missing; fetching nvidia-cutlass==${_fa_ver} from ${_fa_index}")
  file(DOWNLOAD "${_fa_index}/nvidia-cutlass/" "${_fa_tmp}/index.html" STATUS _fa_st)
  list(GET _fa_st 0 _fa_code)
  set(_fa_ok FALSE)
  if(_fa_code EQUAL 0)
    file(READ "${_fa_tmp}/index.html" _fa_html)
    string(REGEX MATCH "href=\"([^\"]*nvidia_cutlass-${_fa_ver}-py3-none-any\\.whl)#sha256=([0-9a-f]+)\""
           _fa_m "${_fa_html}")
    if(_fa_m)
      set(_fa_url "${CMAKE_MATCH_1}")
      set(_fa_sha "${CMAKE_MATCH_2}")
      if(NOT _fa_url MATCHES "^https?://")
        set(_fa_url "${_fa_index}/nvidia-cutlass/${_fa_url}")
      endif()
      file(DOWNLOAD "${_fa_url}" "${_fa_tmp}/cutlass.whl" EXPECTED_HASH SHA256=${_fa_sha} STATUS _fa_st)
      list(GET _fa_st 0 _fa_code)
      if(_fa_code EQUAL 0)
        file(ARCHIVE_EXTRACT INPUT "${_fa_tmp}/cutlass.whl" DESTINATION "${_fa_tmp}/x"
             PATTERNS "cutlass_library/source/include/*")
        if(EXISTS "${_fa_tmp}/x/cutlass_library/source/include/cute/tensor.hpp")
          file(REMOVE_RECURSE "${_fa_cutlass_dest}")
          file(MAKE_DIRECTORY "${_fa_cutlass_dest}")
          file(RENAME "${_fa_tmp}/x/cutlass_library/source/include" "${_fa_cutlass_dest}/include")
          file(WRITE "${_fa_cutlass_dest}/VERSION" "${_fa_ver}\n")
          set(_fa_ok TRUE)
        endif()
      endif()
    endif()
  endif()
  file(REMOVE_RECURSE "${_fa_tmp}")
  if(_fa_ok)
    message(STATUS "flashattn: CuTe headers installed in ${_fa_cutlass_dest}/include")
  else()
    message(WARNING "flashattn: could not fetch nvidia-cutlass==${_fa_ver} (${_fa_st}); run scripts/setup "
                    "or pass -DFLASHATTN_CUTLASS_INCLUDE=<cutlass>/include")
  endif()
endif()
