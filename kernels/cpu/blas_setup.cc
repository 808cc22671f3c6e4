#include "kernels/cpu/blas_setup.h"

#include <cblas.h>
#include <strings.h>

#include <cstdlib>
#include <mutex>

#include "common/logging.h"

// Exported by DYNAMIC_ARCH builds of OpenBLAS only; weak so other builds still link.
extern "C" void gotoblas_dynamic_init(void) __attribute__((weak));
extern "C" void gotoblas_dynamic_quit(void) __attribute__((weak));

namespace recall::kernels::cpu {
namespace {

// OpenBLAS x86-64 kernel sets that use at least AVX2 + FMA.
bool IsAvx2Core(const char* name) {
  static const char* const kCores[] = {"haswell",        "skylakex", "cooperlake",
                                       "sapphirerapids", "zen",      "excavator"};
  for (const char* core : kCores) {
    if (strcasecmp(name, core) == 0) return true;
  }
  return false;
}

void RepairCoreSelection() {
#if defined(__x86_64__)
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return;  // the user chose
  if (gotoblas_dynamic_init == nullptr || gotoblas_dynamic_quit == nullptr) return;
  const char* current = openblas_get_corename();
  if (current == nullptr || IsAvx2Core(current)) return;
  __builtin_cpu_init();
  const char* wanted = nullptr;
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")) {
    wanted = "SkylakeX";
  } else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    wanted = "Haswell";
  }
  if (wanted == nullptr) return;
  const std::string before = current;
  setenv("OPENBLAS_CORETYPE", wanted, 1);
  gotoblas_dynamic_quit();
  gotoblas_dynamic_init();
  unsetenv("OPENBLAS_CORETYPE");
  RECALL_LOG(DEBUG) << "OpenBLAS picked the '" << before << "' kernels for this CPU; using '"
                   << BlasCoreName() << "' (set OPENBLAS_CORETYPE to override)";
#endif
}

}  // namespace

void ConfigureBlas() {
  static std::once_flag once;
  std::call_once(once, RepairCoreSelection);
  openblas_set_num_threads(1);
}

std::string BlasCoreName() {
  const char* name = openblas_get_corename();
  return name == nullptr ? "unknown" : name;
}

}  // namespace recall::kernels::cpu
