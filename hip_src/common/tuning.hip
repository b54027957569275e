// The process-wide tuning values (tuning.h): defaults, the environment read once, overrides.
#include "tuning.h"

#include <cstdlib>
#include <cstring>

namespace {

RaTuning from_environment() {
  RaTuning t;
  for (const RaTuningKnob& knob : kRaTuningKnobs) {
    const char* env = getenv(knob.env);
    if (env != nullptr && env[0] != '\0') t.*knob.field = atoi(env);
  }
  return t;
}

// NOTE: launches and overrides come from host threads that torch serialises per stream; an
// override while another thread launches may be seen by that launch or the next, both valid.
RaTuning& current() {
  static RaTuning tuning = from_environment();
  return tuning;
}

}  // namespace

const RaTuning& ra_tuning() { return current(); }

bool ra_set_tuning(const char* name, int value, int* old) {
  for (const RaTuningKnob& knob : kRaTuningKnobs) {
    if (strcmp(knob.name, name) != 0) continue;
    if (old != nullptr) *old = current().*knob.field;
    current().*knob.field = value;
    return true;
  }
  return false;
}
