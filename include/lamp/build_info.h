#pragma once

#include <string>

#include <lamp/config.h>
#include <lamp/export.h>

namespace lamp {

/// One line that says how this lamp was built and what it runs on, e.g.
/// "lamp 0.1.0, LibTorch 2.11.0, CUDA 13.0 (runtime 13.0), NCCL 2.28.9,
/// cuDNN 9.19.0". CUDA, NCCL and cuDNN appear only when lamp was built with
/// them; the runtime versions are read at call time.
///
/// Example:
/// \code
///   std::cout << lamp::build_info() << "\n";
/// \endcode
LAMP_API std::string build_info();

} // namespace lamp
