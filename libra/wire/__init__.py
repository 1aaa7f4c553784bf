"""Proto <-> domain converters. Written once; servers, clients and stores all use them."""
