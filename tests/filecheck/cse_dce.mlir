// RUN: lucid-opt %s --pass-pipeline=cse,dce

// Two identical exps become one; the unused sum goes; different attributes stay apart.
// CHECK: %a = lucid.exp %x
// CHECK-NEXT: %c = lucid.add %a, %a
// CHECK-NEXT: %s0 = lucid.sum %c {dim = 0 : i64, keepdim = false}
// CHECK-NEXT: %s1 = lucid.sum %c {dim = 1 : i64, keepdim = false}
// CHECK-NEXT: func.return %s0, %s1
func.func @f(%x: tensor<2x2xf32>) -> (tensor<2xf32>, tensor<2xf32>) {
  %a = lucid.exp %x : (tensor<2x2xf32>) -> tensor<2x2xf32>
  %b = lucid.exp %x : (tensor<2x2xf32>) -> tensor<2x2xf32>
  %c = lucid.add %a, %b : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
  %dead = lucid.sum %c : (tensor<2x2xf32>) -> tensor<f32>
  %s0 = lucid.sum %c {dim = 0 : i64, keepdim = false} : (tensor<2x2xf32>) -> tensor<2xf32>
  %s1 = lucid.sum %c {dim = 1 : i64, keepdim = false} : (tensor<2x2xf32>) -> tensor<2xf32>
  func.return %s0, %s1 : tensor<2xf32>, tensor<2xf32>
}
