"""Train a diffusers video transformer with BackLite attention.

    pip install diffusers
    python examples/diffusers_video_transformer.py

use_back_lite(model) gives every attention module of a diffusers model a BackLite processor:
BackLiteAttnProcessor on the classic `Attention` modules (UNet, DiT, PixArt: also settable with
`model.set_attn_processor(BackLiteAttnProcessor(negl_prob))`), and a BackLiteSDPAProcessor wrapper
around the model-specific processors (here Wan's), which routes their scaled_dot_product_attention
calls through BackLite. The model below is a tiny, randomly initialised WanTransformer3DModel (no
download) trained for a few flow-matching steps on random latents.
"""
import torch
import torch.nn.functional as F

from back_lite.integrations.diffusers import use_back_lite


def main():
    from diffusers import WanTransformer3DModel

    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2,
                                  attention_head_dim=64, in_channels=4, out_channels=4,
                                  text_dim=64, freq_dim=64, ffn_dim=256, num_layers=2,
                                  rope_max_seq_len=256).to(device)
    print("processors set:", use_back_lite(model, negl_prob=0.05))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    autocast = torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda")
    for step in range(3):
        # latents (B, C, frames, H, W): 8 frames x 16 x 16 patches = 2048 video tokens
        x0 = torch.randn(1, 4, 8, 32, 32, device=device)
        noise = torch.randn_like(x0)
        t = torch.rand(1, device=device)
        xt = (1 - t) * x0 + t * noise
        text = torch.randn(1, 16, 64, device=device)
        with autocast:
            pred = model(hidden_states=xt, timestep=(t * 1000).long(),
                         encoder_hidden_states=text).sample
        loss = F.mse_loss(pred.float(), noise - x0)
        loss.backward()
        opt.step()
        opt.zero_grad()
        print(f"step {step}: loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
