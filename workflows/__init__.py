"""Pure domain: workflow state machines, the phase protocol and the job domain. No I/O."""
