"""livemeet: real-time meeting transcription with speaker labels (MOSS-Transcribe-Diarize)."""

__version__ = "0.1.0"
