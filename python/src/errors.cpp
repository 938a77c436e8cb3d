// kvoffload.Error and kvoffload.ErrorCode.
#include <pybind11/eval.h>

#include <kvoffload/error.hpp>

#include "bindings.hpp"

namespace py = pybind11;

namespace kvoffload::python {

void bind_errors(py::module_& m) {
  // py::arithmetic: codes compare and convert like ints (they equal the C API's kvo_status values).
  py::enum_<ErrorCode> codes(m, "ErrorCode", py::arithmetic(),
                             "Stable error codes (the C API's kvo_status)");
  // Every code of error_codes.h, named as in C without the KVO_ prefix.
#define KVOFFLOAD_PY_ERROR_CODE_(number, upper, camel, name) \
  codes.value(#upper, ErrorCode::k##camel);
  KVOFFLOAD_ERROR_CODES(KVOFFLOAD_PY_ERROR_CODE_)
#undef KVOFFLOAD_PY_ERROR_CODE_

  // Error(message, code=ErrorCode.INTERNAL, errno=0, call="") is defined in Python so it is an
  // ordinary class users can subclass and construct; the translator fills its attributes.
  py::dict scope;
  scope["ErrorCode"] = m.attr("ErrorCode");
  py::exec(R"(
class Error(RuntimeError):
    """A kvoffload failure. str(e) is the message of the step that failed; .code is a
    kvoffload.ErrorCode, .errno the errno or device error (0 when none), .call the failing call."""

    message: str
    code: ErrorCode
    errno: int
    call: str

    def __init__(self, message: str, code: ErrorCode = ErrorCode.INTERNAL, errno: int = 0,
                 call: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.code = ErrorCode(int(code))
        self.errno = errno
        self.call = call

    @property
    def code_name(self) -> str:
        return self.code.name.lower()
)",
           scope);
  py::object error_type = scope["Error"];
  error_type.attr("__module__") = "kvoffload";
  m.attr("Error") = error_type;

  // Kept alive for the process: the translator runs until interpreter shutdown.
  static py::object* error_class = new py::object(error_type);
  // pybind11 stores translators as void (*)(std::exception_ptr): the parameter must be by value.
  // NOLINTNEXTLINE(performance-unnecessary-value-param)
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& e) {
      py::object exc = (*error_class)(e.what(), e.code(), e.sys_errno(), e.call());
      PyErr_SetObject(error_class->ptr(), exc.ptr());
    }
  });

  m.def(
      "error_code_name", [](ErrorCode c) { return std::string(to_string(c)); },
      "Stable name of an error code, e.g. 'invalid_argument'");
}

}  // namespace kvoffload::python
