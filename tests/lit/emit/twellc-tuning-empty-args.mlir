// twellc compile's tuning options given an empty value are refused, naming the option (an empty
// --tuning-dir compiled a bundle without tuned choices and said nothing; an empty --tuning-workload
// embedded every workload).
// RUN: not twellc compile --d-model 64 --d-ff 64 --tuning-dir "" -o %t.bundle 2>&1 | FileCheck %s --check-prefix=DIR
// RUN: not twellc compile --d-model 64 --d-ff 64 --tuning-dir %S --tuning-workload "" -o %t.bundle 2>&1 | FileCheck %s --check-prefix=WORKLOAD
// DIR: twellc compile: --tuning-dir: expected a tuning database directory (twellc tune's), got ''
// WORKLOAD: twellc compile: --tuning-workload: expected a workload name (e.g. density:0.5%, pattern:<16 hex>), got ''

func.func @unused() {
  return
}
