# Install and export: headers (C++ and the C API kvoffload.h), libkvoffload, the CMake package
# (find_package(kvoffload) -> kvoffload::kvoffload), a pkg-config file, and the `kvoffload` program.
# The Python package is installed by python/CMakeLists.txt (KVOFFLOAD_PYTHON_INSTALL_DIR).
#
# Everything installed is relocatable: `cmake --install <build> --prefix P` works for any P (the
# CMake package uses PACKAGE_PREFIX_DIR, the .pc file ${pcfiledir}, binaries $ORIGIN RPATHs).
include(CMakePackageConfigHelpers)

install(TARGETS kvoffload EXPORT kvoffloadTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/core/include/kvoffload
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} FILES_MATCHING PATTERN "*.hpp" PATTERN "*.h")
install(FILES ${PROJECT_BINARY_DIR}/generated/include/kvoffload/version.hpp
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/kvoffload)
install(EXPORT kvoffloadTargets NAMESPACE kvoffload::
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/kvoffload)

# The installed program finds libkvoffload next to it (<prefix>/bin -> <prefix>/<libdir>).
if(TARGET kvoffload_cli)
  file(RELATIVE_PATH _kvo_bin_to_lib ${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_BINDIR}
       ${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_LIBDIR})
  set_target_properties(kvoffload_cli PROPERTIES INSTALL_RPATH "$ORIGIN/${_kvo_bin_to_lib}")
endif()

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/kvoffloadConfig.cmake.in
  ${PROJECT_BINARY_DIR}/kvoffloadConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/kvoffload
  PATH_VARS CMAKE_INSTALL_INCLUDEDIR CMAKE_INSTALL_BINDIR)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/kvoffloadConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/kvoffloadConfig.cmake
              ${PROJECT_BINARY_DIR}/kvoffloadConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/kvoffload)

# pkg-config: prefix relative to the .pc file's own directory, so the file stays right wherever
# the tree is installed (pkgconf and freedesktop pkg-config both define ${pcfiledir}).
file(RELATIVE_PATH _kvo_pc_to_prefix ${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_LIBDIR}/pkgconfig
     ${CMAKE_INSTALL_PREFIX})
string(REGEX REPLACE "/$" "" KVOFFLOAD_PC_PREFIX "\${pcfiledir}/${_kvo_pc_to_prefix}")
configure_file(${PROJECT_SOURCE_DIR}/cmake/kvoffload.pc.in ${PROJECT_BINARY_DIR}/kvoffload.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/kvoffload.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
