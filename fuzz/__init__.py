"""Coverage-guided fuzz targets (atheris) over the decoders, the rewrite paths and the pipeline."""
