// The training flags `train` and `launch` share (layout, model, data, schedule), bound to a config.
#pragma once

#include "command.h"
#include "megascope/runtime/train.h"

namespace megascope::cli {

po::options_description TrainingOptions(runtime::TrainConfig* config);

}  // namespace megascope::cli
