// Autotuning results that outlive the process: a small key -> value store per (GPU name, driver
// version) in the kernel cache directory, so a tuning run on one machine serves every later process
// on it and a new driver or a different GPU tunes afresh.
#pragma once

#include <optional>
#include <string>

namespace flashport::cuda::autotune {

/// FLASHPORT_AUTOTUNE=1 (core::tuning()): launchers time their candidate shapes on the first problem of
/// each bucket and keep the fastest. Off otherwise: the built-in tables decide.
bool enabled();

/// "autotune-<gpu name>-drv<driver version>.txt"; characters of the name outside [A-Za-z0-9._-]
/// become '_' ("NVIDIA H200" -> "autotune-NVIDIA_H200-drv13000.txt").
std::string file_name(const std::string& gpu_name, int driver_version);

/// The file that holds the entries of this GPU and driver under jit::cache_dir()'s directory (read
/// even when it is read-only); empty when there is no readable cache directory.
std::string file_path(const std::string& gpu_name, int driver_version);

/// The value stored under `key`, from this process or from the file (read once per file, then kept
/// in memory). Lines of the file that do not parse are ignored.
std::optional<std::string> lookup(const std::string& gpu_name, int driver_version, const std::string& key);

/// Records `value` under `key` in memory and rewrites the file atomically (entries other processes
/// stored meanwhile are merged in, then a temp file is renamed over it). Without a writable cache
/// directory the entry stays in memory and one warning goes to stderr. Keys must be non-empty
/// without line breaks, values non-empty without whitespace (Error otherwise).
void store(const std::string& gpu_name, int driver_version, const std::string& key, const std::string& value);

/// The same for GPU `device`: its name (jit::device_name) and the driver's version.
std::optional<std::string> lookup(int device, const std::string& key);
void store(int device, const std::string& key, const std::string& value);

/// Forgets the in-memory entries and warnings, as a new process would start (tests).
void reset_for_testing();

}  // namespace flashport::cuda::autotune
