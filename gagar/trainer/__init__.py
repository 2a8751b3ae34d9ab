"""The trainer: GAGAR advantages, the policy loss, the Megatron-Core policy and the driver."""
