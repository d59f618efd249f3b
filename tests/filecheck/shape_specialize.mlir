// RUN: lucid-opt %s --pass-pipeline=shape-specialize{batch=8}

// Every ? in the signature, the ops and the function type becomes 8; static dims stay.
// CHECK: func.func @mlp(%x: tensor<8x4xf32>, %w: tensor<3x4xf32>, %b: tensor<3xf32>) -> tensor<8x3xf32> {
// CHECK-NEXT: %h = lucid.linear %x, %w, %b : (tensor<8x4xf32>, tensor<3x4xf32>, tensor<3xf32>) -> tensor<8x3xf32>
// CHECK-NEXT: %s = lucid.softmax %h {dim = -1 : i64} : (tensor<8x3xf32>) -> tensor<8x3xf32>
// CHECK-NEXT: func.return %s : tensor<8x3xf32>
// CHECK-NOT: ?
func.func @mlp(%x: tensor<?x4xf32>, %w: tensor<3x4xf32>, %b: tensor<3xf32>) -> tensor<?x3xf32> {
  %h = lucid.linear %x, %w, %b : (tensor<?x4xf32>, tensor<3x4xf32>, tensor<3xf32>) -> tensor<?x3xf32>
  %s = lucid.softmax %h {dim = -1 : i64} : (tensor<?x3xf32>) -> tensor<?x3xf32>
  func.return %s : tensor<?x3xf32>
}

// -----

// Result types come from the registry's shape rules, not from substituting 8 for ?: a reshape
// to [-1, 4] of 8x8 has 16 rows, a cat of two batches along dim 0 has 16, a sum over the
// batch has none.
// CHECK: %r = lucid.reshape %x {shape = array<i64: -1, 4>} : (tensor<8x8xf32>) -> tensor<16x4xf32>
// CHECK-NEXT: %c = lucid.cat %x, %x {dim = 0 : i64} : (tensor<8x8xf32>, tensor<8x8xf32>) -> tensor<16x8xf32>
// CHECK-NEXT: %m = lucid.sum %x {dim = 0 : i64, keepdim = false} : (tensor<8x8xf32>) -> tensor<8xf32>
// CHECK-NEXT: func.return %r, %c, %m : tensor<16x4xf32>, tensor<16x8xf32>, tensor<8xf32>
func.func @derived(%x: tensor<?x8xf32>) -> (tensor<?x4xf32>, tensor<?x8xf32>, tensor<8xf32>) {
  %r = lucid.reshape %x {shape = array<i64: -1, 4>} : (tensor<?x8xf32>) -> tensor<?x4xf32>
  %c = lucid.cat %x, %x {dim = 0 : i64} : (tensor<?x8xf32>, tensor<?x8xf32>) -> tensor<?x8xf32>
  %m = lucid.sum %x {dim = 0 : i64, keepdim = false} : (tensor<?x8xf32>) -> tensor<8xf32>
  func.return %r, %c, %m : tensor<?x4xf32>, tensor<?x8xf32>, tensor<8xf32>
}

// -----

// A shape-like attribute holding the symbolic dim ([unit, 6]) gets the size too, and becomes
// the array<i64: ...> a static shape prints as.
// CHECK: %e = lucid.expand %x {shape = array<i64: 8, 6>} : (tensor<8x1xf32>) -> tensor<8x6xf32>
func.func @attr(%x: tensor<?x1xf32>) -> tensor<?x6xf32> {
  %e = lucid.expand %x {shape = [unit, 6 : i64]} : (tensor<?x1xf32>) -> tensor<?x6xf32>
  func.return %e : tensor<?x6xf32>
}

// -----

// A nested index spec keeps its units: there None is an open slice end, not the batch.
// CHECK: %i = lucid.index %x {index = [["slice", unit, unit, unit], ["slice", unit, 1 : i64, unit]]} : (tensor<8x5xf32>) -> tensor<8x1xf32>
func.func @index(%x: tensor<?x5xf32>) -> tensor<?x1xf32> {
  %i = lucid.index %x {index = [["slice", unit, unit, unit], ["slice", unit, 1 : i64, unit]]} : (tensor<?x5xf32>) -> tensor<?x1xf32>
  func.return %i : tensor<?x1xf32>
}

// -----

// Scalar constants and a module with no symbolic dim are left as they are.
// CHECK: %c = lucid.constant 2.000000e+00 : f64 -> tensor<f32>
// CHECK-NEXT: %y = lucid.mul %x, %c : (tensor<2x3xf32>, tensor<f32>) -> tensor<2x3xf32>
func.func @static(%x: tensor<2x3xf32>) -> tensor<2x3xf32> {
  %c = lucid.constant 2.0 : f64 -> tensor<f32>
  %y = lucid.mul %x, %c : (tensor<2x3xf32>, tensor<f32>) -> tensor<2x3xf32>
  func.return %y : tensor<2x3xf32>
}

// -----

// A size the graph cannot take fails the pass, naming the op: a batch of 8 does not broadcast
// against 5 rows (the symbolic batch might have been 5 or 1).
// ERROR: pass 'shape-specialize' failed: ShapeSpecializeError: op #0 lucid.add:
func.func @bad_size(%x: tensor<?x3xf32>, %y: tensor<5x3xf32>) -> tensor<5x3xf32> {
  %r = lucid.add %x, %y : (tensor<?x3xf32>, tensor<5x3xf32>) -> tensor<5x3xf32>
  func.return %r : tensor<5x3xf32>
}

// -----

// A static dim that contradicts the specialised inference is an error, not silently rewritten.
// ERROR: op #0 lucid.exp: a result is declared tensor<4x3xf32> but the op gives tensor<8x3xf32>
func.func @contradiction(%x: tensor<?x3xf32>) -> tensor<4x3xf32> {
  %e = lucid.exp %x : (tensor<?x3xf32>) -> tensor<4x3xf32>
  func.return %e : tensor<4x3xf32>
}
