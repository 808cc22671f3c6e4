// The default calibration text of `recall calibrate`: about 2,000 words of plain English
// prose (simple stories, in the register small story models are trained on). Written for
// this project.
#pragma once

namespace recall::cli {

// A NUL-terminated static string.
const char* DefaultCalibrationText();

}  // namespace recall::cli
