# Link MLIR and LLVM statically (../shared/design/BUILD_NOTES.md): Debian's MLIR archives name the
# shared libLLVM.so.22.1 (150 MB) as a dependency, which a GPU machine without LLVM lacks. Replace the
# `LLVM` entry of every imported target of this directory by the static LLVM component libraries.
# Call after find_package(MLIR) in the same directory.
function(twell_link_mlir_statically)
  set(LLVM_LINK_LLVM_DYLIB OFF PARENT_SCOPE)
  llvm_map_components_to_libnames(_static Support Demangle TargetParser BinaryFormat Core Remarks
                                  BitstreamReader)
  get_property(_targets DIRECTORY PROPERTY IMPORTED_TARGETS)
  foreach(target IN LISTS _targets)
    get_target_property(_libs ${target} INTERFACE_LINK_LIBRARIES)
    if(_libs AND "LLVM" IN_LIST _libs)
      list(REMOVE_ITEM _libs LLVM)
      list(APPEND _libs ${_static})
      set_target_properties(${target} PROPERTIES INTERFACE_LINK_LIBRARIES "${_libs}")
    endif()
  endforeach()
endfunction()
