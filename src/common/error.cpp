#include "common/error.h"

#include <cstdarg>
#include <cstdio>
#include <string>

namespace flashattn {
namespace {
thread_local std::string g_last_error;
}

flashattn_status set_error(flashattn_status status, const char* fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  g_last_error = buf;
  return status;
}

void clear_error() { g_last_error.clear(); }

const char* last_error() { return g_last_error.c_str(); }

}  // namespace flashattn
