// Scratch memory that a backend's stream-ordered pool lends to one library call (split-KV partials, dQ
// accumulators, rotated queries): backend-neutral, each GPU backend names its own release.
#pragma once

#include <utility>

namespace flashport::core {

/// Owns `ptr` until free() (the call's normal end: a failing release throws) or the destructor (an error
/// path: the release runs, and the error already in flight is the one reported). `Release` is called as
/// release(ptr), stream-ordered, never synchronising.
template <class Release>
class StreamScratch {
 public:
  StreamScratch(void* ptr, Release release) : ptr_(ptr), release_(std::move(release)) {}
  ~StreamScratch() {
    if (!ptr_) return;
    try {
      release_(ptr_);
    } catch (...) {  // unwinding already: the first error is the one to report
    }
  }
  StreamScratch(const StreamScratch&) = delete;
  StreamScratch& operator=(const StreamScratch&) = delete;
  char* bytes() const { return static_cast<char*>(ptr_); }
  void free() {
    if (void* p = std::exchange(ptr_, nullptr)) release_(p);
  }

 private:
  void* ptr_;
  Release release_;
};

}  // namespace flashport::core
