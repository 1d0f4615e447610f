"""`gpuperfd check`: the one-shot flow under one deadline, its command and its interconnect step."""
