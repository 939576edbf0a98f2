// The one exception type flashport throws.
#pragma once

#include <stdexcept>
#include <string>

namespace flashport {

/// Raised for every invalid argument and every backend failure. `argument()` names the offending
/// argument ("q", "cu_seqlens_k", "window_left", ...) or is empty for failures with no single culprit.
/// The message always contains the argument name and, where it applies, expected vs actual.
class Error : public std::runtime_error {
 public:
  Error(std::string argument, const std::string& message)
      : std::runtime_error(argument.empty() ? message : argument + ": " + message),
        argument_(std::move(argument)) {}
  const std::string& argument() const noexcept { return argument_; }

 private:
  std::string argument_;
};

}  // namespace flashport
