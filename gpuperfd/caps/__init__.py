"""The power-cap state below probing and apply: the journal of caps changed, the locks that say who owns a
GPU's cap, the compare-before-write guard, the operator's hold and the emergency restore. It imports neither
probing nor apply."""
