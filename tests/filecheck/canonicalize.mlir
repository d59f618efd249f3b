// RUN: lucid-opt %s --pass-pipeline=canonicalize

// x * 1 + 0 is x: both ops and their constants go.
// CHECK: func.func @identities(%x: tensor<2x3xf32>) -> tensor<2x3xf32> {
// CHECK-NEXT: func.return %x : tensor<2x3xf32>
func.func @identities(%x: tensor<2x3xf32>) -> tensor<2x3xf32> {
  %one = lucid.constant 1 : i64 -> tensor<i64>
  %zero = lucid.constant 0.0 : f64 -> tensor<f32>
  %a = lucid.mul %x, %one : (tensor<2x3xf32>, tensor<i64>) -> tensor<2x3xf32>
  %b = lucid.add %zero, %a : (tensor<f32>, tensor<2x3xf32>) -> tensor<2x3xf32>
  func.return %b : tensor<2x3xf32>
}

// -----

// An int tensor times 1.0 is a float tensor: the mul stays.
// CHECK: %one = lucid.constant 1.000000e+00 : f64 -> tensor<f32>
// CHECK-NEXT: %a = lucid.mul %x, %one : (tensor<3xi64>, tensor<f32>) -> tensor<3xf32>
func.func @promotes(%x: tensor<3xi64>) -> tensor<3xf32> {
  %one = lucid.constant 1.0 : f64 -> tensor<f32>
  %a = lucid.mul %x, %one : (tensor<3xi64>, tensor<f32>) -> tensor<3xf32>
  func.return %a : tensor<3xf32>
}

// -----

// reshape(reshape(x)) is one reshape of x; transpose(transpose(x)) is x.
// CHECK: %{{.*}} = lucid.reshape %x {shape = array<i64: 6, 2>} : (tensor<3x4xf32>) -> tensor<6x2xf32>
// CHECK-NOT: lucid.permute
// CHECK: func.return %b, %x
func.func @shapes(%x: tensor<3x4xf32>) -> (tensor<6x2xf32>, tensor<3x4xf32>) {
  %a = lucid.reshape %x {shape = array<i64: 12>} : (tensor<3x4xf32>) -> tensor<12xf32>
  %b = lucid.reshape %a {shape = array<i64: 6, 2>} : (tensor<12xf32>) -> tensor<6x2xf32>
  %t = lucid.permute %x {dims = array<i64: 1, 0>} : (tensor<3x4xf32>) -> tensor<4x3xf32>
  %u = lucid.permute %t {dims = array<i64: 1, 0>} : (tensor<4x3xf32>) -> tensor<3x4xf32>
  func.return %b, %u : tensor<6x2xf32>, tensor<3x4xf32>
}

// -----

// Constant subgraphs fold through the registry's kernels: exp(0) * 2 is 2.
// CHECK: lucid.constant dense<2.000000e+00> : tensor<2xf32> -> tensor<2xf32>
// CHECK-NOT: lucid.exp
// CHECK: lucid.add
func.func @folds(%x: tensor<2xf32>) -> tensor<2xf32> {
  %c = lucid.constant dense<0.0> : tensor<2xf32> -> tensor<2xf32>
  %two = lucid.constant 2 : i64 -> tensor<i64>
  %e = lucid.exp %c : (tensor<2xf32>) -> tensor<2xf32>
  %m = lucid.mul %e, %two : (tensor<2xf32>, tensor<i64>) -> tensor<2xf32>
  %r = lucid.add %x, %m : (tensor<2xf32>, tensor<2xf32>) -> tensor<2xf32>
  func.return %r : tensor<2xf32>
}
