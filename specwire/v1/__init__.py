"""Generated gRPC code for the specwire protocol (see proto/)."""
