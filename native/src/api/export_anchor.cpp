// The shared library is pyengine_core linked whole-archive; this file only gives the target a
// source. The exported symbols are the pe_* functions of api/*.cpp.
