"""TensorLights: give one parameter-server job at a time the green light at the NIC."""

__version__ = "0.1.0"
