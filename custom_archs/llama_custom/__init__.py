# ===----------------------------------------------------------------------=== #
# Copyright (c) 2026, Modular Inc. All rights reserved.
#
# Licensed under the Apache License v2.0 with LLVM Exceptions:
# https://llvm.org/LICENSE.txt
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
# ===----------------------------------------------------------------------=== #
"""A correct Llama-derived custom architecture for MAX 26.7 (copied from max/pipelines/architectures/llama3,
registered under its own name so it does not replace the built-in)."""

from .arch import llama_arch
from .batch_processor import Llama3BatchProcessor
from .model import Llama3Inputs, Llama3Model, LlamaModelBase
from .model_config import Llama3Config

__all__ = [
    "Llama3BatchProcessor",
    "Llama3Config",
    "Llama3Inputs",
    "Llama3Model",
    "LlamaModelBase",
    "llama_arch",
]

ARCHITECTURES = [llama_arch]
