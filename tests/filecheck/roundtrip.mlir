// RUN: lucid-opt %s

// The custom form prints back as written; roles, symbolic dims and every attribute kind survive.
// CHECK: func.func @forward(%x: tensor<?x3xf32> {lucid.role = "input:0"}, %b: tensor<3xf32> {lucid.role = "param:fc.bias"}) -> (tensor<?x3xf32> {lucid.role = "output:0"}) {
// CHECK-NEXT: %y = lucid.add %x, %b : (tensor<?x3xf32>, tensor<3xf32>) -> tensor<?x3xf32>
// CHECK-NEXT: %d = lucid.cast %y {dtype = f64} : (tensor<?x3xf32>) -> tensor<?x3xf64>
// CHECK-NEXT: %f = lucid.cast %d {dtype = f32} : (tensor<?x3xf64>) -> tensor<?x3xf32>
// CHECK-NEXT: %g = lucid.gelu %f {approximate = "tanh"} : (tensor<?x3xf32>) -> tensor<?x3xf32>
// CHECK-NEXT: func.return %g : tensor<?x3xf32>
func.func @forward(%x: tensor<?x3xf32> {lucid.role = "input:0"}, %b: tensor<3xf32> {lucid.role = "param:fc.bias"}) -> (tensor<?x3xf32> {lucid.role = "output:0"}) {
  %y = lucid.add %x, %b : (tensor<?x3xf32>, tensor<3xf32>) -> tensor<?x3xf32>
  %d = lucid.cast %y {dtype = f64} : (tensor<?x3xf32>) -> tensor<?x3xf64>
  %f = lucid.cast %d {dtype = f32} : (tensor<?x3xf64>) -> tensor<?x3xf32>
  %g = lucid.gelu %f {approximate = "tanh"} : (tensor<?x3xf32>) -> tensor<?x3xf32>
  func.return %g : tensor<?x3xf32>
}
