# Install and export: headers, libkvoffload, the CMake package (find_package(kvoffload) ->
# kvoffload::kvoffload) and a pkg-config file.
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

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/kvoffloadConfig.cmake.in
  ${PROJECT_BINARY_DIR}/kvoffloadConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/kvoffload)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/kvoffloadConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/kvoffloadConfig.cmake
              ${PROJECT_BINARY_DIR}/kvoffloadConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/kvoffload)

configure_file(${PROJECT_SOURCE_DIR}/cmake/kvoffload.pc.in ${PROJECT_BINARY_DIR}/kvoffload.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/kvoffload.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
