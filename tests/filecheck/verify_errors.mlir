// RUN: lucid-opt %s

// An attribute the op does not take is refused, naming the op and the attribute.
// ERROR: does not verify: lucid.sum has no attribute 'dimm'; it takes ['dim', 'dtype', 'keepdim']
func.func @typo(%x: tensor<2x3xf32>) -> tensor<2xf32> {
  %s = lucid.sum %x {dimm = 1 : i64, dim = 1 : i64} : (tensor<2x3xf32>) -> tensor<2xf32>
  func.return %s : tensor<2xf32>
}

// -----

// The same on a constant.
// ERROR: lucid.constant has no attribute 'colour'
func.func @constant() -> tensor<f32> {
  %c = lucid.constant 1.0 : f64 {colour = 2 : i64} -> tensor<f32>
  func.return %c : tensor<f32>
}

// -----

// A parse error is file:line:column on one line, with xDSL's placeholder filled in.
// ERROR: case.mlir:{{[0-9]+}}:18: Expected suffix identifier after '%'
func.func @percent(%x: tensor<2xf32>) -> tensor<2xf32> {
  %a = lucid.exp % : (tensor<2xf32>) -> tensor<2xf32>
  func.return %a : tensor<2xf32>
}

// -----

// Registered attributes verify as before.
// CHECK: %s = lucid.sum %x {dim = 1 : i64, keepdim = true} : (tensor<2x3xf32>) -> tensor<2x1xf32>
func.func @fine(%x: tensor<2x3xf32>) -> tensor<2x1xf32> {
  %s = lucid.sum %x {dim = 1 : i64, keepdim = true} : (tensor<2x3xf32>) -> tensor<2x1xf32>
  func.return %s : tensor<2x1xf32>
}
