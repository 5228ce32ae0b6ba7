"""Small shared helpers below the model: files, processes, device strings, model folders."""
