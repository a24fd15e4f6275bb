"""Offline stand-in for rules_java: re-exports Bazel's native Java rules."""
java_library = native.java_library
java_binary = native.java_binary
java_test = native.java_test
java_import = native.java_import
java_toolchain = native.java_toolchain
java_runtime = native.java_runtime
java_plugin = native.java_plugin
java_proto_library = native.java_proto_library
java_lite_proto_library = native.java_lite_proto_library
