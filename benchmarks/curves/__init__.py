"""Real training curves with known ends: the script that trains them and the loader that reads them."""
