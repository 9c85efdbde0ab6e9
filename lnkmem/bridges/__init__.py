"""Places things live: a local folder, a files bridge, a storage bridge.

Every source the engine reads (Home, conversations, skills, notes) and every
place it writes (notes, the index copy) is a :class:`~lnkmem.bridges.place.Place`;
session code never knows which kind it has.
"""
