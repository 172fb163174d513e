"""decodelab: the library behind the course "生成与解码基础".

Each module has one job; see the repository README for the map.
"""

__version__ = "0.1.0"
