"""sensorium-core: the front door — resolve, validate, admit, dispatch, record."""
