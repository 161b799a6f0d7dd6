"""What a model is: its signature, how it is exported and compiled, checked for parity, and laid out as a Triton
model folder (config, golden samples, ensembles). Imports only the ground floor.

    signature       the inputs and outputs a model promises, with their ranged dimensions
    model_source    loading the user's model: module:function, a file, a checkpoint on S3
    export          the export step: torch.export or TorchScript, golden samples
    trace_retarget  re-tracing a TorchScript module for another device or precision
    compile         the compile step: TorchScript or Torch-TensorRT, checked against eager
    parity          comparing outputs within a precision's tolerance
    settings        what export and compile take: their settings types, with the defaults and bounds
    model_config    Triton's config.pbtxt: building, parsing, serving settings
    model_folder    a Triton model folder on disk: config, version, golden samples, checks
    ensemble        ensembles of Python steps and compiled models, as one release
    eval_data       a labelled evaluation set, read in chunks and checked against a signature
"""
