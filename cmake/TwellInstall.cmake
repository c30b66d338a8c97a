# `cmake --install build --prefix P`: the public headers, libtwell_runtime.so, libtwell_jit.so and a
# twellConfig.cmake, so that `find_package(twell)` gives the targets twell::runtime (ahead-of-time
# bundles only: no LLVM, MLIR or NVRTC) and twell::jit (compiles on demand). examples/aot_host uses it.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)
install(TARGETS twell_kernels twell_runtime twell_jit EXPORT twellTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/kernels/include/twell ${PROJECT_SOURCE_DIR}/runtime/include/twell
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
# The host/device parameter blocks (twell/format.h includes them); the device templates stay embedded
# in libtwell_jit.so.
install(FILES ${PROJECT_SOURCE_DIR}/kernels/device/twell/device/params.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/twell/device)
install(FILES ${PROJECT_SOURCE_DIR}/compiler/include/twell/compiler/Generate.h
              ${PROJECT_SOURCE_DIR}/compiler/include/twell/compiler/Jit.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/twell/compiler)
install(TARGETS twellc RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(EXPORT twellTargets NAMESPACE twell:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/twell)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/twellConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/twellConfig.cmake
                              INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/twell)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/twellConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/twellConfig.cmake ${PROJECT_BINARY_DIR}/twellConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/twell)
