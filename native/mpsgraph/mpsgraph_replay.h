// Replaying a recorded program into an MPSGraph (Objective-C++; included by the .mm files only).
#pragma once

#import <MetalPerformanceShadersGraph/MetalPerformanceShadersGraph.h>

#include <string>
#include <vector>

#include "mpsgraph_native.h"

namespace lucid::mpsgraph {

// The MPSGraph objects a program turns into.
struct ReplayedGraph {
  MPSGraph* graph = nil;
  std::vector<MPSGraphTensor*> placeholders;  // program feed order
  NSArray<MPSGraphTensor*>* targets = nil;     // program result order
};

// Builds `program` into a new MPSGraph: its placeholders, then one method call per recorded call.
// Throws std::invalid_argument naming the call for a malformed program (unknown selector, wrong
// argument kind or count, undefined tensor id) and std::runtime_error when MPSGraph raises.
ReplayedGraph replay(const Program& program);

// The MPSDataType of a name such as "MPSDataTypeFloat32"; throws std::invalid_argument.
MPSDataType mps_data_type(const std::string& name);
// The name of an MPSDataType; throws std::invalid_argument for types the backend does not use.
std::string mps_data_type_name(MPSDataType type);

}  // namespace lucid::mpsgraph
