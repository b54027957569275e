// The emulation build's <hip/hip_runtime.h>: found before the system ROCm headers (-I).
#pragma once
#include "../../hip_cpu_runtime.h"
