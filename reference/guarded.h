// The CPU references allocate host buffers (bounded by what the inputs need, but a valid
// input can still need more memory than the host has): run_guarded turns the exceptions the
// standard library throws then into a Status, so that no exception leaves the library.
#pragma once

#include <new>
#include <stdexcept>
#include <string>
#include <system_error>

#include "mlakit/status.h"

namespace mlakit::reference {

template <typename Body>
Status run_guarded(const char* op, Body&& body) {
  auto exhausted = [op](const std::string& what) {
    return Status(StatusCode::kResourceExhausted, std::string(op) + ": " + what);
  };
  try {
    body();
    return Status::ok();
  } catch (const std::bad_alloc&) {
    return exhausted("host memory: the reference's buffers for this input could not be allocated");
  } catch (const std::length_error&) {
    return exhausted("host memory: the reference's buffers for this input exceed the largest allocation");
  } catch (const std::system_error& e) {
    return exhausted(std::string("host resources: ") + e.what());
  }
}

}  // namespace mlakit::reference
