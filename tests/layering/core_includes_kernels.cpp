// Must NOT compile: core sits left of kernels (DESIGN.md §2), so the kernels
// headers are not on core's include path. Built only by the layering test.
#include "kernels/ops.h"
int main() { return 0; }
