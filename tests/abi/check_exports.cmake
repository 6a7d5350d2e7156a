# check_exports.cmake: the `exports` test. Run as
#   cmake -DNM=<nm> -DLIBRARY=<libregroup.so> -DHEADER=<abi/regroup.h> -P check_exports.cmake
# It fails when libregroup.so exports a symbol that does not start with `regroup_`, when a
# function declared in regroup.h is not exported, or when an exported `regroup_` symbol is not
# declared in regroup.h (the header is the library's whole public surface).
cmake_minimum_required(VERSION 3.20)
foreach(var NM LIBRARY HEADER)
  if(NOT ${var})
    message(FATAL_ERROR "check_exports.cmake: -D${var}=... is required")
  endif()
endforeach()
if(NOT EXISTS "${LIBRARY}")
  message(FATAL_ERROR "check_exports.cmake: ${LIBRARY} does not exist")
endif()

execute_process(
  COMMAND "${NM}" -D --defined-only "${LIBRARY}"
  OUTPUT_VARIABLE nm_output
  ERROR_VARIABLE nm_error
  RESULT_VARIABLE nm_result)
if(NOT nm_result EQUAL 0)
  message(FATAL_ERROR "${NM} -D --defined-only ${LIBRARY} failed (${nm_result}): ${nm_error}")
endif()

# Exported symbols: the last field of each line ("0000000000012340 T regroup_engine_new").
# A versioned name ("name@@VERS") counts by its name.
string(REPLACE "\n" ";" nm_lines "${nm_output}")
set(exported "")
set(offenders "")
foreach(line IN LISTS nm_lines)
  string(STRIP "${line}" line)
  if(line STREQUAL "")
    continue()
  endif()
  string(REGEX REPLACE "^.*[ \t]" "" symbol "${line}")
  string(REGEX REPLACE "@.*$" "" symbol "${symbol}")
  if(symbol MATCHES "^regroup_")
    list(APPEND exported "${symbol}")
  else()
    list(APPEND offenders "${line}")
  endif()
endforeach()

# Functions declared in the header: `REGROUP_EXTERN <type> [*]regroup_name(`.
file(READ "${HEADER}" header_text)
string(REGEX MATCHALL "REGROUP_EXTERN[^;(]*[ \t\n*]regroup_[A-Za-z0-9_]+[ \t\n]*\\(" decls
       "${header_text}")
set(declared "")
foreach(decl IN LISTS decls)
  string(REGEX MATCH "regroup_[A-Za-z0-9_]+[ \t\n]*\\($" name "${decl}")
  string(REGEX REPLACE "[ \t\n]*\\($" "" name "${name}")
  list(APPEND declared "${name}")
endforeach()
list(REMOVE_DUPLICATES declared)
list(LENGTH declared declared_count)
if(declared_count LESS 10)
  message(FATAL_ERROR "found only ${declared_count} declarations in ${HEADER}: the parser of "
                      "this script no longer matches the header's style")
endif()

set(missing "")
foreach(name IN LISTS declared)
  if(NOT name IN_LIST exported)
    list(APPEND missing "${name}")
  endif()
endforeach()
set(undeclared "")
foreach(name IN LISTS exported)
  if(NOT name IN_LIST declared)
    list(APPEND undeclared "${name}")
  endif()
endforeach()

set(failed FALSE)
if(offenders)
  set(failed TRUE)
  list(JOIN offenders "\n  " text)
  message("libregroup exports symbols that do not start with regroup_:\n  ${text}")
endif()
if(missing)
  set(failed TRUE)
  list(JOIN missing "\n  " text)
  message("functions declared in regroup.h are not exported by libregroup:\n  ${text}")
endif()
if(undeclared)
  set(failed TRUE)
  list(JOIN undeclared "\n  " text)
  message("libregroup exports regroup_ symbols that regroup.h does not declare:\n  ${text}")
endif()
if(failed)
  message(FATAL_ERROR "the exports of ${LIBRARY} do not match ${HEADER}")
endif()
list(LENGTH exported exported_count)
message(STATUS "${LIBRARY}: exports exactly the ${declared_count} functions of regroup.h "
               "(${exported_count} symbols, all regroup_)")
